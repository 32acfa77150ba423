# The examples run as tests (included by tests/CMakeLists.txt). Each is short: the seeds' loop exits
# non-zero unless its loss decreases; digits_mlp exits non-zero unless the test accuracy reaches 0.96.
if(TARGET seed_training_loop)
  add_test(NAME examples.seed_training_loop COMMAND seed_training_loop 5)
  set_tests_properties(examples.seed_training_loop PROPERTIES TIMEOUT 120 LABELS examples)
endif()

if(TARGET digits_mlp)
  set(FLUX_DIGITS_DATA ${PROJECT_SOURCE_DIR}/data/digits.csv.gz)

  # The best available device (get_device()), as ./scripts/demo runs it.
  add_test(NAME examples.digits_mlp COMMAND digits_mlp --min-accuracy 0.96 ${FLUX_DIGITS_DATA})
  set_tests_properties(examples.digits_mlp PROPERTIES TIMEOUT 300 LABELS examples)

  # Each device explicitly; exit status 5 (the device is not available here) counts as skipped.
  foreach(dev CPU OpenCL:0 CUDA:0)
    string(REPLACE ":" "_" name ${dev})
    add_test(NAME examples.digits_mlp.${name}
             COMMAND digits_mlp --device ${dev} --min-accuracy 0.96 ${FLUX_DIGITS_DATA})
    set_tests_properties(examples.digits_mlp.${name} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()

  # Bad input: a clear message, no crash.
  add_test(NAME examples.digits_mlp.missing_data COMMAND digits_mlp ${CMAKE_CURRENT_BINARY_DIR}/no-such-file.csv.gz)
  set_tests_properties(examples.digits_mlp.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[read_csv\\] cannot open .*no-such-file\\.csv\\.gz.: no such file")
  add_test(NAME examples.digits_mlp.corrupt_data COMMAND digits_mlp ${PROJECT_SOURCE_DIR}/data/LICENSE-digits)
  set_tests_properties(examples.digits_mlp.corrupt_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[read_csv\\] .*LICENSE-digits. line 1: column 1: .* is not a whole number")

  # --plot (what ./scripts/demo shows at the end): the CSV, the gnuplot script, and the PNG when gnuplot
  # is installed (scripts/deps.sh plot; CI has it); without gnuplot on PATH, the CSV and the command.
  find_program(FLUX_GNUPLOT gnuplot)
  set(plot_check ${CMAKE_COMMAND} -DPROGRAM=$<TARGET_FILE:digits_mlp> -DDATA=${FLUX_DIGITS_DATA} -DEPOCHS=3
                 -DGNUPLOT=${FLUX_GNUPLOT})
  if(FLUX_GNUPLOT)
    add_test(NAME examples.digits_mlp.plot
             COMMAND ${plot_check} -DPREFIX=${CMAKE_CURRENT_BINARY_DIR}/plot/digits_mlp
                     -P ${CMAKE_CURRENT_SOURCE_DIR}/plot/check_plot.cmake)
    set_tests_properties(examples.digits_mlp.plot PROPERTIES TIMEOUT 120 LABELS examples)
  endif()
  add_test(NAME examples.digits_mlp.plot_without_gnuplot
           COMMAND ${plot_check} -DPREFIX=${CMAKE_CURRENT_BINARY_DIR}/plot-no-gnuplot/digits_mlp -DNO_GNUPLOT=1
                   -P ${CMAKE_CURRENT_SOURCE_DIR}/plot/check_plot.cmake)
  set_tests_properties(examples.digits_mlp.plot_without_gnuplot PROPERTIES TIMEOUT 120 LABELS examples)
  add_test(NAME examples.digits_mlp.plot_bad_prefix COMMAND digits_mlp --plot= ${FLUX_DIGITS_DATA})
  set_tests_properties(examples.digits_mlp.plot_bad_prefix PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "--plot expects a path prefix")
endif()

# The convolutional examples (issue 11). Times are for this 2-core CI machine; PoCL runs each op on
# the CPU through OpenCL, far slower per op, so its runs are shorter (the bar is stated per entry).
if(TARGET digits_lenet)
  set(FLUX_DIGITS_DATA ${PROJECT_SOURCE_DIR}/data/digits.csv.gz)
  # LeNet-style CNN, same seeded 80/20 split as digits_mlp: >= 0.98 test accuracy on every device.
  # CPU 10 epochs (0.99 measured), OpenCL:0 6 epochs (0.989 measured), CUDA:0 the default 15.
  foreach(dev_epochs CPU=10 OpenCL:0=6 CUDA:0=15)
    string(REGEX REPLACE "=.*" "" dev ${dev_epochs})
    string(REGEX REPLACE ".*=" "" epochs ${dev_epochs})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.digits_lenet.${label}
             COMMAND digits_lenet --device ${dev} --epochs ${epochs} --min-accuracy 0.98 ${FLUX_DIGITS_DATA})
    set_tests_properties(examples.digits_lenet.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  add_test(NAME examples.digits_lenet.missing_data COMMAND digits_lenet ${CMAKE_CURRENT_BINARY_DIR}/no-such-file.csv.gz)
  set_tests_properties(examples.digits_lenet.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[read_csv\\] cannot open .*no-such-file\\.csv\\.gz.: no such file")
endif()

if(TARGET fashion_mnist_cnn)
  # The short variant on every device: the first 6,000 training images for one epoch, 2,000 test
  # images, bar 0.70 (measured 0.780 on CPU, 0.781 on OpenCL:0; 2,000 images give only ~0.46 on both).
  # The full run (60,000 images) is measured in the example's header. The saved model goes to the build folder.
  foreach(dev CPU OpenCL:0 CUDA:0)
    string(REPLACE ":" "_" label ${dev})
    set(limits --train-limit 6000 --test-limit 2000 --min-accuracy 0.70)
    add_test(NAME examples.fashion_mnist_cnn.${label}
             COMMAND fashion_mnist_cnn --device ${dev} --epochs 1 ${limits}
                     --save ${CMAKE_CURRENT_BINARY_DIR}/fashion_mnist_cnn_${label}.safetensors)
    set_tests_properties(examples.fashion_mnist_cnn.${label} PROPERTIES TIMEOUT 600 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  # Without the data set: a clear message naming the folder and the Debian package.
  add_test(NAME examples.fashion_mnist_cnn.missing_data COMMAND fashion_mnist_cnn ${CMAKE_CURRENT_BINARY_DIR}/no-such-folder)
  set_tests_properties(examples.fashion_mnist_cnn.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[load_fashion_mnist\\] folder '[^']*no-such-folder' does not exist; install Debian's dataset-fashion-mnist package")
endif()

if(TARGET char_lstm)
  # The short variant (issue 12): LSTM(62 => 128) for one epoch, then the validation loss per character
  # must have fallen by at least 0.8 nats from the untrained model's ~4.13 (log 62). CPU and CUDA:0: the
  # first 60,000 training characters in windows of 64 (30 steps of 32), 20,000 validation characters
  # (measured on CPU: 4.127 -> 3.018, ~10 s). OpenCL:0 (PoCL runs each op through OpenCL on the CPU, far
  # slower per op): 20,000 characters in windows of 16 (40 steps), 5,000 validation characters
  # (measured: 4.127 -> 3.085, ~27 s). The full run (defaults) is described in examples/char_lstm.cpp.
  set(FLUX_CHAR_LSTM_SHORT --hidden 128 --epochs 1 --train-limit 60000 --valid-limit 20000)
  set(FLUX_CHAR_LSTM_SHORT_OPENCL --hidden 128 --epochs 1 --seq-len 16 --train-limit 20000 --valid-limit 5000)
  foreach(dev CPU OpenCL:0 CUDA:0)
    string(REPLACE ":" "_" label ${dev})
    set(limits ${FLUX_CHAR_LSTM_SHORT})
    if(dev STREQUAL "OpenCL:0")
      set(limits ${FLUX_CHAR_LSTM_SHORT_OPENCL})
    endif()
    add_test(NAME examples.char_lstm.${label}
             COMMAND char_lstm --device ${dev} ${limits} --min-drop 0.8 --sample 200)
    set_tests_properties(examples.char_lstm.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  add_test(NAME examples.char_lstm.missing_data COMMAND char_lstm ${CMAKE_CURRENT_BINARY_DIR}/no-such-text.txt.gz)
  set_tests_properties(examples.char_lstm.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[load_text\\] cannot open '[^']*no-such-text\\.txt\\.gz': no such file")
endif()

if(TARGET tiny_transformer)
  # The short variant (issue 12): batch 16, 64 validation windows of 64 characters; the validation loss
  # must fall by at least 1.5 nats per character from the untrained model's (measured 4.774 -> 2.481
  # after 40 steps, the same on CPU and OpenCL:0). CPU 60 steps, OpenCL:0 (PoCL) 40 steps, CUDA 60.
  # The full run (the example's defaults) is described in its header.
  foreach(dev_steps CPU=60 OpenCL:0=40 CUDA:0=60)
    string(REGEX REPLACE "=.*" "" dev ${dev_steps})
    string(REGEX REPLACE ".*=" "" steps ${dev_steps})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.tiny_transformer.${label}
             COMMAND tiny_transformer --device ${dev} --epochs 1 --steps ${steps} --batchsize 16 --valid-windows 64
                     --sample 40 --min-drop 1.5)
    set_tests_properties(examples.tiny_transformer.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  add_test(NAME examples.tiny_transformer.missing_data COMMAND tiny_transformer ${CMAKE_CURRENT_BINARY_DIR}/no-such-file.txt)
  set_tests_properties(examples.tiny_transformer.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: .*no-such-file\\.txt")
endif()

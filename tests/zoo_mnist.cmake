# Flux model-zoo ports (issue 32, examples/zoo/): each runs briefly on Fashion-MNIST (Debian's
# dataset-fashion-mnist, in the `test` package group) with a loss or accuracy bar. Exit status 5 (the
# device does not exist here) counts as skipped. Measured on this 2-core machine (busy with other
# builds); PoCL runs each op through OpenCL on the CPU, so its runs are shorter. Most of a CPU run's
# ~4 s is reading the 60,000 training images.
if(TARGET zoo_conv_mnist)
  # LeNet-5 (autosize, train), 2 epochs at eta 3e-3 on the first N training images, 1,000 test images:
  # CPU N = 3000 0.690 (4 s), OpenCL:0 N = 1500 0.667 (19 s); untrained 0.096. Bar 0.6.
  foreach(dev_limit CPU=3000 OpenCL:0=1500 CUDA:0=3000)
    string(REGEX REPLACE "=.*" "" dev ${dev_limit})
    string(REGEX REPLACE ".*=" "" limit ${dev_limit})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.conv_mnist.${label}
             COMMAND zoo_conv_mnist --device ${dev} --epochs 2 --eta 3e-3 --train-limit ${limit} --test-limit 1000
                     --min-accuracy 0.6)
    set_tests_properties(examples.zoo.conv_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  add_test(NAME examples.zoo.conv_mnist.missing_data COMMAND zoo_conv_mnist ${CMAKE_CURRENT_BINARY_DIR}/no-such-folder)
  set_tests_properties(examples.zoo.conv_mnist.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[load_fashion_mnist\\] folder '[^']*no-such-folder' does not exist")
endif()
if(TARGET zoo_vae_mnist)
  # The VAE, one epoch: the mean loss (negative ELBO per image + penalty) starts at 552 (one batch,
  # untrained); CPU 4,000 images 418 (5 s), OpenCL:0 2,500 images 457 (9 s). Bars 450 and 500.
  foreach(dev_limit_bar CPU=4000=450 OpenCL:0=2500=500 CUDA:0=4000=450)
    string(REPLACE "=" ";" parts ${dev_limit_bar})
    list(GET parts 0 dev)
    list(GET parts 1 limit)
    list(GET parts 2 bar)
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.vae_mnist.${label}
             COMMAND zoo_vae_mnist --device ${dev} --epochs 1 --train-limit ${limit} --max-loss ${bar})
    set_tests_properties(examples.zoo.vae_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
endif()
if(TARGET zoo_dcgan_mnist)
  # The DCGAN, one epoch of a few steps: the discriminator's mean loss must fall below its untrained
  # 2 log 2 = 1.386 (bar 1.3) and every loss stay finite. CPU 20 steps of 32: 1.153 (20 s on the busy
  # machine); OpenCL:0 8 steps of 16: 1.223 (50 s, the generator's transposed convolutions on PoCL).
  foreach(dev_batch_limit CPU=32=640 OpenCL:0=16=128 CUDA:0=32=640)
    string(REPLACE "=" ";" parts ${dev_batch_limit})
    list(GET parts 0 dev)
    list(GET parts 1 batch)
    list(GET parts 2 limit)
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.dcgan_mnist.${label}
             COMMAND zoo_dcgan_mnist --device ${dev} --epochs 1 --batch-size ${batch} --train-limit ${limit}
                     --verbose-freq 5 --max-dscr-loss 1.3)
    set_tests_properties(examples.zoo.dcgan_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
endif()

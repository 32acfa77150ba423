# Flux model-zoo ports (issue 32, examples/zoo/): each runs briefly on Fashion-MNIST (Debian's
# dataset-fashion-mnist, in the `test` package group) with a loss or accuracy bar. Exit status 5 (the
# device does not exist here) counts as skipped. Times measured on this 2-core CI machine; PoCL runs
# each op through OpenCL on the CPU, so its runs are shorter.
if(TARGET zoo_conv_mnist)
  # LeNet-5 (autosize, train): one epoch on the first 3,000 training images, 1,000 test images.
  foreach(dev_limit CPU=3000 OpenCL:0=1000 CUDA:0=3000)
    string(REGEX REPLACE "=.*" "" dev ${dev_limit})
    string(REGEX REPLACE ".*=" "" limit ${dev_limit})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.conv_mnist.${label}
             COMMAND zoo_conv_mnist --device ${dev} --epochs 1 --train-limit ${limit} --test-limit 1000 --min-accuracy 0.55)
    set_tests_properties(examples.zoo.conv_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
  add_test(NAME examples.zoo.conv_mnist.missing_data COMMAND zoo_conv_mnist ${CMAKE_CURRENT_BINARY_DIR}/no-such-folder)
  set_tests_properties(examples.zoo.conv_mnist.missing_data PROPERTIES LABELS examples
                       PASS_REGULAR_EXPRESSION "data error: \\[load_fashion_mnist\\] folder '[^']*no-such-folder' does not exist")
endif()
if(TARGET zoo_vae_mnist)
  # The VAE: one epoch; the mean negative ELBO per image must fall well below the untrained ~543
  # nats (784 log 2).
  foreach(dev_limit CPU=4000 OpenCL:0=1000 CUDA:0=4000)
    string(REGEX REPLACE "=.*" "" dev ${dev_limit})
    string(REGEX REPLACE ".*=" "" limit ${dev_limit})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.vae_mnist.${label}
             COMMAND zoo_vae_mnist --device ${dev} --epochs 1 --train-limit ${limit} --max-loss 400)
    set_tests_properties(examples.zoo.vae_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
endif()
if(TARGET zoo_dcgan_mnist)
  # The DCGAN: a few steps of batch 32; the discriminator's mean loss must fall below its untrained
  # 2 log 2 = 1.386 and every loss stay finite.
  foreach(dev_limit CPU=640 OpenCL:0=128 CUDA:0=640)
    string(REGEX REPLACE "=.*" "" dev ${dev_limit})
    string(REGEX REPLACE ".*=" "" limit ${dev_limit})
    string(REPLACE ":" "_" label ${dev})
    add_test(NAME examples.zoo.dcgan_mnist.${label}
             COMMAND zoo_dcgan_mnist --device ${dev} --epochs 1 --batch-size 32 --train-limit ${limit} --verbose-freq 5
                     --max-dscr-loss 1.2)
    set_tests_properties(examples.zoo.dcgan_mnist.${label} PROPERTIES TIMEOUT 300 LABELS examples SKIP_RETURN_CODE 5)
  endforeach()
endif()

"""The GPU bench's cases (benchmarks/gpu/bench.py), free of torch so that CPU tests can read
them next to the measurements in benchmarks/results/gpu/."""

# name: (input NCHW, filter HWIO, padding, mode, dtype). Depthwise: filter in-depth 1 with
# as many output channels as input channels. Mode "transpose_train" is conv2d_transpose's
# training step: the shapes are those of the conv2d it transposes (the input is the
# transpose's output), at the stride STRIDES gives.
CASES = {
  "seed_forward": ((200, 1, 321, 481), (135, 135, 1, 3), "VALID", "forward", "float32"),
  "seed_train": ((16, 1, 321, 481), (135, 135, 1, 3), "VALID", "train", "float32"),
  "k63_train": ((8, 16, 128, 128), (63, 63, 16, 16), "SAME", "train", "float32"),
  "replk31_train_f32": ((64, 128, 56, 56), (31, 31, 1, 128), "SAME", "train", "float32"),
  "replk31_train_f16": ((64, 128, 56, 56), (31, 31, 1, 128), "SAME", "train", "float16"),
  "slak51_train_f32": ((64, 256, 32, 32), (51, 51, 1, 256), "SAME", "train", "float32"),
  "slak51_train_f16": ((64, 256, 32, 32), (51, 51, 1, 256), "SAME", "train", "float16"),
  "k3_train": ((64, 64, 56, 56), (3, 3, 64, 64), "SAME", "train", "float32"),
  # Medium filters in float16, where a tensor-core implicit GEMM would compete.
  "k7_train_f16": ((32, 64, 56, 56), (7, 7, 64, 64), "SAME", "train", "float16"),
  "k15_train_f16": ((32, 64, 56, 56), (15, 15, 64, 64), "SAME", "train", "float16"),
  # Either side of the route's crossover between cuDNN and ours (planning.routing.device_routes):
  # 21x21 with 32 channels, 31x31 with 64.
  "k21_c32_train": ((8, 32, 64, 64), (21, 21, 32, 32), "SAME", "train", "float32"),
  "k31_c64_train": ((8, 64, 64, 64), (31, 31, 64, 64), "SAME", "train", "float32"),
  "k31_c64_train_f16": ((8, 64, 64, 64), (31, 31, 64, 64), "SAME", "train", "float16"),
  # conv1d's geometry (height 1): the long-filter case, 4095 taps, 16 -> 16.
  "conv1d_4095_train": ((8, 16, 1, 65536), (1, 4095, 16, 16), "SAME", "train", "float32"),
  # conv2d_transpose's bench case: (4, 128, 128, 32) -> (4, 256, 256, 16), 31x31, stride 2.
  "transpose31_train": ((4, 16, 256, 256), (31, 31, 16, 32), "SAME", "transpose_train", "float32"),
}

# The stride of a case (both spatial axes); 1 where not listed.
STRIDES = {"transpose31_train": 2}

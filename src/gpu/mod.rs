//! The GPU backend: device discovery, NVRTC-compiled kernels, device memory and streams.

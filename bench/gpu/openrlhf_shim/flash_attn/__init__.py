"""Stand-in for flash-attn's Python helpers (no kernels); see bench/gpu/openrlhf_shim/README.md."""

__version__ = "0.0.0+rlrun-shim"

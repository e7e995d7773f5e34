"""Per-node GPU Manager daemon (GPU discovery, model cache, job execution). Arrives with the GPU-path issue."""

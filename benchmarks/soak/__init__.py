"""`raypd bench soak`: `raypd serve` under steady load below its capacity for a long run, every process's RSS, file descriptors and threads sampled; map in docs/architecture.md."""

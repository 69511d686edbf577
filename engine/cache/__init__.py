"""KV memory: the pool, the block allocator and the radix prefix cache (docs/architecture.md, engine/)."""

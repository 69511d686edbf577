"""`raypd bench tenants`: an interactive tenant alone and beside another tenant's flood on `raypd serve`,
with tenant fairness on and off, and with priorities instead of tenants; map in docs/architecture.md."""

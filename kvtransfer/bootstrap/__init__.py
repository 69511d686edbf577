"""The bootstrap channel: its msgpack messages, the sender's server and the receiver's client (docs/architecture.md, kvtransfer/)."""

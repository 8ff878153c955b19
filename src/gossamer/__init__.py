"""gossamer: decentralized and communication-efficient training."""

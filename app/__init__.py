"""EAGLE Lens: a real EAGLE-2 speculative decoding engine and a teaching app around it."""

"""EAGLE Lens: a real EAGLE-2 speculative decoding engine and a teaching app around it."""
import os

# OpenMP threads that wait at a barrier sleep instead of spinning. With spinning (libgomp's
# default) a forward on 2 threads beside another busy process took 5.0 s instead of 0.4 s on
# a 2-core machine (load 5, the embedded model's decode + 4-token forward): the spinning
# thread competes with the neighbour for the core its partner needs. Must be set before
# torch loads its OpenMP runtime, so here, before any torch import; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

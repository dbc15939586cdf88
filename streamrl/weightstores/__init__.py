"""Weight-store backends, one module each (`shm`, `directory`); see `streamrl.weights` for the interface.

`streamrl.weights.make_weight_store` imports the one the config names, so a backend's optional
dependencies are only needed where it is used.
"""

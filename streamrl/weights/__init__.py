"""Weight-store backends: `shm`, `directory` (both on `files`), `cuda_ipc` (wire format in
`cuda_ipc`, trainer side in `cuda_ipc_publish`, generator and vLLM side in `cuda_ipc_load`) and
`torchstore`; see `streamrl.weights.store` for the publisher and loader interfaces.

`streamrl.weights.store.make_publisher` / `make_loader` import the one the config names, so a backend's
optional dependencies are only needed where it is used.
"""

"""The sandbox the `python` tool runs model-written code in: bubblewrap, seccomp, cgroups, user namespaces."""

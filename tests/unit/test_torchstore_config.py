"""weights.torchstore_addr: one routable address, no wildcard, scheme or port (docs/multihost.md,
"TorchStore between processes")."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from streamrl.config.schema import WeightsConfig


@pytest.mark.parametrize("addr", ["127.0.0.1", "10.0.0.12", "trainer-0.cluster.local", "fd00::12"])
def test_an_address_of_this_host_is_kept(addr):
    assert WeightsConfig(backend="torchstore", torchstore_addr=addr).torchstore_addr == addr


@pytest.mark.parametrize("addr", ["0.0.0.0", "::", "[::]", "tcp://10.0.0.12", "10.0.0.12:29600"])
def test_a_wildcard_scheme_or_port_is_refused_naming_the_fix(addr):
    with pytest.raises(ValidationError, match="route to .*e.g. 10.0.0.12; the port is weights.torchstore_port"):
        WeightsConfig(backend="torchstore", torchstore_addr=addr)

"""The `mooncake` backend's pure parts: the slot header (a seqlock) and the engine address's resolution.

pytest tests/unit/test_mooncake_slots.py
"""

from __future__ import annotations

import torch

from streamrl.weights.mooncake_engine import HEADER_BYTES, MAGIC, begin_write, end_write, parse_header, route_address


def test_a_write_moves_seq_through_odd_to_the_next_even():
    slot = torch.zeros(HEADER_BYTES + 16, dtype=torch.uint8)
    before = parse_header(slot)[0]
    begin_write(slot)
    assert parse_header(slot)[0] % 2 == 1  # a reader that sees this discards what it reads
    end_write(slot, version=7, length=16)
    assert parse_header(slot) == (before + 2, 7, 16, MAGIC)
    begin_write(slot)
    end_write(slot, version=8, length=16)
    assert parse_header(slot)[:2] == (before + 4, 8)  # a header read before and after the rewrite differs


def test_engine_address_follows_the_route_to_the_broker():
    for url in ("redis://:***@127.0.0.1:6379/0", "redis+cluster://:***@127.0.0.1:7000,10.0.0.9:7001"):
        assert route_address(url) == "127.0.0.1"
    assert route_address("unix:///run/redis.sock") == "127.0.0.1"  # same host by construction
    assert route_address("embedded") == "127.0.0.1"

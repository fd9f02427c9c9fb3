"""Fleet targets of kex.Client without a kexd: which addresses are a fleet,
what gRPC target they become, what is refused, and the node a token names.
tests/integration/test_fleet_clients.sh runs the Client against three real
kexds (jobs spread, calls pinned, a node killed)."""
import pytest

import kex
from kex import _client


def test_single_addresses_are_not_fleets():
    for addr in ("127.0.0.1:50051", "localhost:50051", "unix:/tmp/kexd.sock", "ipv4:127.0.0.1:1"):
        assert _client._fleet(addr) is None


def test_lists_become_ip_targets():
    assert _client._fleet("127.0.0.1:1,10.0.0.2:2") == ("ipv4:127.0.0.1:1,10.0.0.2:2", ["127.0.0.1:1", "10.0.0.2:2"],
                                                        "127.0.0.1")
    assert _client._fleet("[::1]:1,[fe80::2]:2")[0] == "ipv6:[::1]:1,[fe80::2]:2"
    assert _client._fleet("dns:///kexd.example:50051") == ("dns:///kexd.example:50051", None, None)
    assert _client._fleet("ipv4:127.0.0.1:1,127.0.0.1:2")[:2] == ("ipv4:127.0.0.1:1,127.0.0.1:2",
                                                                  ["127.0.0.1:1", "127.0.0.1:2"])


@pytest.mark.parametrize("addr", ["kexd-a:1,kexd-b:2", "127.0.0.1:1,[::1]:2", "127.0.0.1,127.0.0.2:2",
                                  "127.0.0.1:1,", "127.0.0.1:x,127.0.0.1:2",
                                  "127.0.0.1:65536,127.0.0.1:2"])
def test_bad_lists_are_refused(addr):
    with pytest.raises(ValueError, match="dns:///|IPv4 or all IPv6"):
        kex.Client(addr)


def test_token_node():
    hexpart = "0123456789abcdef" * 2
    assert _client._token_node(f"{hexpart}.node-a@127.0.0.1:50051") == ("node-a", "127.0.0.1:50051")
    assert _client._token_node(hexpart) is None
    assert _client._token_node(f"{hexpart}.node-a") is None


def test_list_limit_both_sides():
    ok = ",".join(f"127.0.0.1:{p}" for p in range(1, 65))
    assert _client._fleet(ok)[1] == ok.split(",")
    with pytest.raises(ValueError, match="at most 64"):
        kex.Client(ok + ",127.0.0.1:65")

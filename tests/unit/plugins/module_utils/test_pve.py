"""The one Proxmox client of the collection: how validate_certs is read, and calls that fail in one sentence."""

from __future__ import annotations

import pytest
from ansible_collections.eagle3.ops.plugins.module_utils._pve import PveClient, PveError, parse_validate_certs


@pytest.mark.parametrize(
    ("given", "expected"),
    [(True, True), (False, False), ("true", True), ("Yes", True), ("no", False), ("False", False), ("0", False),
     ("/etc/pve/pve-root-ca.pem", "/etc/pve/pve-root-ca.pem")],
)
def test_validate_certs_is_read_one_way_for_module_and_inventory(given, expected):
    assert parse_validate_certs(given) == expected


def test_a_failed_call_is_one_sentence_naming_it():
    class Refused(Exception):
        status_code = 401

    def boom():
        raise Refused("401 Unauthorized: authentication failure")

    with pytest.raises(PveError, match=r"^Listing the nodes: the API refused the credentials"):
        PveClient(api=None).call("Listing the nodes", boom)


def test_a_call_the_cluster_could_not_proxy_to_its_node_says_so_and_keeps_the_status():
    from proxmoxer.core import ResourceException

    def offline():  # what proxmoxer raises for pveproxy's answer when the node the call is proxied to is down
        raise ResourceException(595, "Errors during connection establishment, proxy handshake", "No route to host")

    with pytest.raises(PveError) as err:
        PveClient(api=None).call("GET nodes/pve2/lxc/131/config", offline)
    assert err.value.status == 595
    assert str(err.value) == (
        "GET nodes/pve2/lxc/131/config: the cluster cannot reach that node (595 No route to host): it is offline or "
        "cut off from the cluster; bring it back, or leave out its containers")  # not "check api_host and api_port"


def test_a_change_refused_for_want_of_quorum_says_what_to_do():
    from proxmoxer.core import ResourceException

    def inquorate():
        raise ResourceException(500, "Internal Server Error", "cluster not ready - no quorum?")

    with pytest.raises(PveError, match=r"^Creating CT 171: the cluster has no quorum \(more than half of its nodes "
                                       r"must be online\), so Proxmox refuses changes: bring its offline nodes back$"):
        PveClient(api=None).call("Creating CT 171", inquorate)

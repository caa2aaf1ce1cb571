"""eagle3_ops.recap: a run's PLAY RECAP as the tests and the benchmarks read it."""

from __future__ import annotations

from eagle3_ops.recap import converged, recap

RUN = """PLAY [Find the servers and the router with nothing to do] *********************
[WARNING]: Could not match supplied host pattern, ignoring: routers

TASK [eagle3.ops.eagle3_common : Say whether the stage runs here: deploy] ******
ok: [ct130] =>
    msg: 'deploy on ct130: nothing to do (as its last complete run left it; fingerprint 3f2a), skipped'

PLAY RECAP *********************************************************************
{lines}

TIME PER ROLE (wall, 1.7 s in all)
  eagle3.ops.eagle3_common                     1.2 s  70.6%
  play                                         0.5 s  29.4%
"""


def _run(changed: int = 0, unreachable: int = 0) -> str:
    """A run's output, its recap lines as ansible-playbook prints them (padded, with trailing blanks)."""
    lines = [f"{host:<27}: ok=7    changed={c}    unreachable={u}    failed=0    skipped=2    rescued=0    ignored=0   "
             for host, c, u in (("ct130", 0, 0), ("ct132", changed, unreachable))]  # fmt: skip
    return RUN.format(lines="\n".join(lines))


def test_every_host_of_the_recap_and_nothing_else():
    got = recap(_run())
    assert set(got) == {"ct130", "ct132"}
    assert got["ct132"] == {"ok": 7, "changed": 0, "unreachable": 0, "failed": 0, "skipped": 2, "rescued": 0,
                            "ignored": 0}  # fmt: skip


def test_converged_only_when_every_host_changed_nothing_and_was_reached():
    assert converged(_run())
    assert not converged(_run(changed=1))
    assert not converged(_run(unreachable=1))
    assert not converged("ERROR! the playbook could not be parsed")  # no recap: not a converged run
    assert recap("ERROR! the playbook could not be parsed") == {}

"""training.hs_store: the hidden-state store's settings, shards and checks."""

from __future__ import annotations

import json
import subprocess
import textwrap

import pytest

from eagle3_ops.payloads.training import hs_store
from tests.modules import ROOT

# torch, safetensors and datasets: the controller's SGLang environment has them (the payload's own runtime
# is in the containers).
TORCH_PY = ROOT / ".venv-sglang" / "bin" / "python"


@pytest.mark.parametrize(("total", "world"), [(10, 3), (160, 1), (7, 4), (3, 5)])
def test_shards_are_contiguous_cover_every_row_once_and_differ_by_at_most_one(total, world):
    shards = [hs_store.shard_rows(total, world, rank) for rank in range(world)]
    assert [i for s in shards for i in s] == list(range(total))
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    # speculators' get_indices_to_process gives the remainder to the first ranks: 10 rows over 3 = 4, 3, 3
    if (total, world) == (10, 3):
        assert shards == [range(0, 4), range(4, 7), range(7, 10)]
    with pytest.raises(ValueError, match="outside a world of 3"):
        hs_store.shard_rows(10, 3, 3)


def test_a_store_made_with_other_settings_is_emptied_and_the_same_settings_keep_it(tmp_path):
    first = {"layers": [1, 3, 4], "numbering": "vllm", "store": "file", "extractor": "vllm"}
    assert hs_store.begin(str(tmp_path), first) == "new"
    (tmp_path / "hs_0.safetensors").write_bytes(b"x")
    (tmp_path / "COMPLETE.json").write_text("{}")
    assert hs_store.begin(str(tmp_path), first) == "kept"
    assert (tmp_path / "hs_0.safetensors").exists() and (tmp_path / "COMPLETE.json").exists()
    # other layers: same shapes, other features - nothing of the old store may be trained on
    assert hs_store.begin(str(tmp_path), {**first, "layers": [2, 3, 4]}) == "reset"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["EXTRACTION.json"]
    # files without a record (an older release of the role) are not trusted either
    (tmp_path / "EXTRACTION.json").unlink()
    (tmp_path / "hs_5.safetensors").write_bytes(b"x")
    assert hs_store.begin(str(tmp_path), first) == "reset" and not (tmp_path / "hs_5.safetensors").exists()


MAKE_STORE = textwrap.dedent("""
    import sys, torch
    from datasets import Dataset
    from safetensors.torch import save_file
    out = sys.argv[1]
    rows = [[5, 6, 7], [8, 9], [1, 2, 3, 4], [4, 4]]
    Dataset.from_dict({"input_ids": rows, "loss_mask": [[1] * len(r) for r in rows],
                       "seq_len": [len(r) for r in rows]}).save_to_disk(out + "/ds")
    def write(i, ids, dtype=torch.bfloat16, fp8=False, slots=4):
        hs = torch.randn(len(ids), slots, 8).to(dtype)
        tensors = {"hidden_states": hs, "token_ids": torch.tensor(ids)}
        if fp8:
            tensors = {"hidden_states": hs.to(torch.float8_e4m3fn), "token_ids": torch.tensor(ids),
                       "hidden_states_scales": torch.ones(len(ids), 1, 1)}
        save_file(tensors, f"{out}/hs/hs_{i}.safetensors")
    import os; os.makedirs(out + "/hs", exist_ok=True)
    write(0, rows[0])
    write(1, [8, 10])              # tokens of another row
    write(2, rows[2], fp8=True)    # the fp8 store's layout
    # row 3 missing
""")


@pytest.mark.skipif(not TORCH_PY.exists(), reason="needs the controller's SGLang environment (torch, datasets)")
def test_check_sets_aside_wrong_files_names_missing_rows_and_marks_a_complete_shard(tmp_path):
    subprocess.run([str(TORCH_PY), "-c", MAKE_STORE, str(tmp_path)], check=True, capture_output=True)

    def check(*extra: str) -> dict:
        argv = [str(TORCH_PY), "-m", "training.hs_store", "check", "--data", str(tmp_path / "ds"),
                "--out", str(tmp_path / "hs"), "--slots", "4", "--hidden", "8", *extra]  # fmt: skip
        proc = subprocess.run(argv, cwd=ROOT / "eagle3_ops" / "payloads", capture_output=True, text=True, check=True)
        return json.loads(proc.stdout)

    whole = check("--all", "--values")
    assert (whole["rows"], whole["missing"], whole["rejected"], whole["complete"]) == (4, 1, 1, False)
    assert whole["missing_first"] == [3] and "token ids differ" in whole["rejected_first"]["1"]
    assert (tmp_path / "hs" / "hs_1.safetensors.rejected").exists() and not (tmp_path / "hs" / "COMPLETE.json").exists()
    # shard 0 of 2 is rows 0-1 (row 1 now missing), shard 1 is rows 2-3
    assert check("--world", "2", "--rank", "0")["missing_first"] == [1]
    # the rows regenerated (as the next run's extraction would), the shard and then the store are complete
    fix = ("import torch; from safetensors.torch import save_file; import sys; out = sys.argv[1]; "
           "[save_file({'hidden_states': torch.zeros(len(ids), 4, 8, dtype=torch.bfloat16), "
           "'token_ids': torch.tensor(ids)}, f'{out}/hs/hs_{i}.safetensors') for i, ids in ((1, [8, 9]), (3, [4, 4]))]")
    subprocess.run([str(TORCH_PY), "-c", fix, str(tmp_path)], check=True, capture_output=True)
    shard = check("--world", "2", "--rank", "1")
    assert shard["complete"] and shard["marker"] == "SHARD-1-of-2.json" and shard["first"] == 2
    whole = check("--all")
    assert whole["complete"] and json.loads((tmp_path / "hs" / "COMPLETE.json").read_text())["samples"] == 4
    # a wrong shape (other layer count) is rejected too
    assert check("--all", "--slots", "3")["rejected"] == 4


def test_progress_against_the_plan_with_an_eta(tmp_path):
    out, state = tmp_path / "hs", str(tmp_path / "progress.json")
    out.mkdir()
    (out / "hs_0.safetensors").write_bytes(b"x" * 2_000_000)
    first = hs_store.progress(str(out), 10_000_000, state, now=1000.0)
    assert first.startswith("[hidden] 2/10 MB written, 8 MB to go, ETA after the next sample")
    (out / "hs_1.safetensors").write_bytes(b"x" * 2_000_000)
    line = hs_store.progress(str(out), 10_000_000, state, now=1010.0)  # 2 MB in 10 s: 6 MB left, 30 s
    assert line == "[hidden] 4/10 MB written, 6 MB to go, ETA 0 min (0.2 MB/s)", line
    (out / "hs_1.safetensors").unlink()
    (out / "hs_0.safetensors").unlink()  # a store emptied (other settings): the measure starts again
    assert "ETA after the next sample" in hs_store.progress(str(out), 10_000_000, state, now=1020.0)
    assert hs_store.main(["progress", "--out", str(out), "--expected", str(50 * 1000**3), "--state", state]) == 0

"""A stand-in for `torchrun -m speculators.train` with its observable behaviour: it resumes from the
newest epoch directory it finds, writes SAVE/<epoch>/ like speculators, and dies of CUDA OOM when
--total-seq-len is above FAKE_OOM_ABOVE. FAKE_EPOCH_SECONDS slows epochs so tests can kill it mid-epoch."""

import argparse
import json
import os
import struct
import sys
import time

ap = argparse.ArgumentParser()
ap.add_argument("--save-path", required=True)
ap.add_argument("--total-seq-len", type=int, required=True)
ap.add_argument("--epochs", type=int, default=3)
args = ap.parse_args()

if args.total_seq_len > int(os.environ.get("FAKE_OOM_ABOVE", "1000000")):
    print("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)

os.makedirs(args.save_path, exist_ok=True)
done = sorted(int(n) for n in os.listdir(args.save_path) if n.isdigit())
start = done[-1] + 1 if done else 1
print(f"resuming after epoch {done[-1]}" if done else "starting from scratch", flush=True)
for epoch in range(start, args.epochs + 1):
    d = os.path.join(args.save_path, str(epoch))
    os.makedirs(d)
    body = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    body += b" " * (-len(body) % 8)
    with open(os.path.join(d, "model.safetensors"), "wb") as fh:
        fh.write(struct.pack("<Q", len(body)) + body)  # tensor data comes last: a kill now leaves it partial
        fh.flush()
        time.sleep(float(os.environ.get("FAKE_EPOCH_SECONDS", "0")))
        fh.write(b"\0" * 8)
    os.chmod(os.path.join(d, "model.safetensors"), 0o600)  # as safetensors 0.8 leaves it (written via a tempfile)
    acc = min(0.9, 0.3 + 0.1 * epoch)
    files = {
        "config.json": {"speculators_model_type": "eagle3"},
        "training_state.json": {"epoch": epoch},
        "val_metrics.json": {"full_acc_0": acc, "full_acc_1": acc * acc, "full_acc_2": acc**3},
    }
    for name, data in files.items():
        with open(os.path.join(d, name), "w") as fh:
            json.dump(data, fh)
    for name in ("optimizer_state_dict.pt", "scheduler_state_dict.pt"):
        with open(os.path.join(d, name), "wb") as fh:
            fh.write(b"state")
    print(f"epoch {epoch} done", flush=True)

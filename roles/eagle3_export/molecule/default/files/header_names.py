"""Print the tensor names of a safetensors file as a JSON list (standard library only)."""

import json
import struct
import sys

with open(sys.argv[1], "rb") as fh:
    (length,) = struct.unpack("<Q", fh.read(8))
    header = json.loads(fh.read(length))
print(json.dumps(sorted(k for k in header if k != "__metadata__")))

"""Asks for more GPU memory than is free (the driver refuses it), prints the error, exits."""
import torch

free, total = torch.cuda.mem_get_info()
try:
    torch.empty(free + (8 << 30), dtype=torch.uint8, device="cuda")
    print("allocated?!")
except torch.OutOfMemoryError as e:
    print("refused:", str(e).splitlines()[0])

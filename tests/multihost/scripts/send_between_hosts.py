"""Rank 0 sends a buffer to the last rank; each end prints its host and what it saw."""

import socket

import numpy as np
from mpi4py import MPI

comm = MPI.COMM_WORLD
rank, last = comm.Get_rank(), comm.Get_size() - 1
hosts = comm.allgather(socket.gethostname())
if rank == 0:
    comm.Send(np.arange(1000, dtype=np.float64), dest=last, tag=7)
elif rank == last:
    buf = np.empty(1000, dtype=np.float64)
    comm.Recv(buf, source=0, tag=7)
    print(f"rank {last} on {hosts[last]} got {buf.sum():g} from rank 0 on {hosts[0]}", flush=True)

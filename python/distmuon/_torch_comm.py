"""A distmuon communicator over a torch.distributed process group (gloo on CPU tensors).

The C++ core calls these methods with NumPy arrays over its own buffers; torch.from_numpy shares
their memory, so nothing is copied on the way in or out. A group without a CPU backend (NCCL
only: init_process_group("nccl")) gets each buffer staged through a CUDA tensor on the current
device instead (the control plane's small buffers; distmuon's data plane on CUDA is its own NCCL
communicator, bootstrapped through this one, docs/gpu.md). gloo has no reduce_scatter on CPU: it is
an all_reduce of a copy, of which this rank keeps its slice.
"""

import atexit
import os

import torch
import torch.distributed as dist

_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN}


def _group_ranks(group):
    """Global ranks of a process group, in group-rank order."""
    if group is None or group is dist.group.WORLD:
        return list(range(dist.get_world_size()))
    if hasattr(dist, "get_process_group_ranks"):
        return list(dist.get_process_group_ranks(group))
    from torch.distributed import distributed_c10d as c10d  # torch < 2.0

    ranks = c10d._pg_group_ranks[group]
    return sorted(ranks, key=lambda g: ranks[g])


_exit_hook = False


def _destroy_at_exit():
    # A job whose script ends without destroy_process_group(), after distmuon ran collectives
    # through gloo, could abort at interpreter exit ("terminate called without an active
    # exception"); tearing the process groups down before the interpreter's own teardown avoids it.
    if dist.is_initialized():
        dist.destroy_process_group()


class TorchCollectives:
    def __init__(self, group=None):
        global _exit_hook
        if not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised (call init_process_group)")
        if not _exit_hook:
            atexit.register(_destroy_at_exit)
            _exit_hook = True
        self.group = group
        self.ranks = _group_ranks(group)
        self._rank = dist.get_rank(group) if group is not None else dist.get_rank()
        backend = str(dist.get_backend(group))
        self._stage = None  # the CUDA device host buffers travel through (NCCL-only groups)
        if not any(b in backend for b in ("gloo", "mpi", "ucc")) and torch.cuda.is_available():
            self._stage = torch.device("cuda", torch.cuda.current_device())

    def _t(self, buf):
        """A tensor over a NumPy buffer: itself, or a CUDA copy for an NCCL-only group."""
        t = torch.from_numpy(buf)
        return t if self._stage is None else t.to(self._stage)

    def _back(self, buf, t):
        """A staged result back into the NumPy buffer (waits for the collective)."""
        if self._stage is not None:
            torch.from_numpy(buf).copy_(t.cpu())

    def rank(self):
        return self._rank

    def size(self):
        return len(self.ranks)

    def placement(self):
        """The group's global ranks in group order and the torch world's size (the ranks that
        errors name, and how distmuon finds a group's ranks in the optimizer's world)."""
        return list(self.ranks), dist.get_world_size()

    def all_gather(self, send, recv):
        r = self._t(recv)
        dist.all_gather(list(r.view(self.size(), send.shape[0]).unbind(0)), self._t(send),
                        group=self.group)
        self._back(recv, r)

    def all_reduce(self, buf, op):
        t = self._t(buf)
        dist.all_reduce(t, op=_OPS[op], group=self.group)
        self._back(buf, t)

    def reduce_scatter(self, send, recv, op):
        tmp = self._t(send).clone()
        dist.all_reduce(tmp, op=_OPS[op], group=self.group)
        n = recv.shape[0]
        torch.from_numpy(recv).copy_(tmp[self._rank * n:(self._rank + 1) * n].cpu())

    def broadcast(self, buf, root):
        t = self._t(buf)
        dist.broadcast(t, src=self.ranks[root], group=self.group)
        self._back(buf, t)

    def all_to_all_v(self, send, send_counts, recv, recv_counts):
        r = self._t(recv)
        dist.all_to_all_single(r, self._t(send), output_split_sizes=list(recv_counts),
                               input_split_sizes=list(send_counts), group=self.group)
        self._back(recv, r)

    def start_all_to_all_v(self, send, send_counts, recv, recv_counts):
        """all_to_all_v started without waiting (async_op=True): returns torch's work handle,
        whose wait() completes it; send and recv stay in use until then. A group that stages its
        buffers through CUDA runs the blocking call and returns None (nothing left to wait for)."""
        if self._stage is not None:
            self.all_to_all_v(send, send_counts, recv, recv_counts)
            return None
        return dist.all_to_all_single(torch.from_numpy(recv), torch.from_numpy(send),
                                      output_split_sizes=list(recv_counts),
                                      input_split_sizes=list(send_counts), group=self.group,
                                      async_op=True)

    def barrier(self):
        dist.barrier(group=self.group)

    def split(self, color, key):
        # torch.distributed.new_group must be called by every process of the job, for every new
        # group, in the same order: only the whole world can be split.
        if self.size() != dist.get_world_size():
            raise RuntimeError("torch.distributed: only the world communicator can be split "
                               f"(this group has {self.size()} of {dist.get_world_size()} ranks)")
        dev = self._stage or torch.device("cpu")
        mine = torch.tensor([color, key], dtype=torch.int64, device=dev)
        every = [torch.empty(2, dtype=torch.int64, device=dev) for _ in range(self.size())]
        dist.all_gather(every, mine, group=self.group)
        members = {}
        for r, t in enumerate(every):
            members.setdefault(int(t[0]), []).append((int(t[1]), r))
        mine_group = None
        for c in sorted(members):
            ordered = [self.ranks[r] for _, r in sorted(members[c])]
            if ordered != sorted(ordered):
                raise RuntimeError("torch.distributed: a split whose key order differs from the "
                                   "rank order is not supported (new_group orders by rank)")
            g = dist.new_group(ranks=ordered)
            if c == color:
                mine_group = g
        return TorchCollectives(mine_group)

    def abort(self, code):
        os._exit(code)

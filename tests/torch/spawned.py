"""What the tests' own spawned ranks share: a free port for the rendezvous, and the way out.

leave(): a rank that has written its results and destroyed its process group leaves with os._exit(0), past
interpreter exit, where torch's C++ teardown aborts now and then under load (torch 2.15: "terminate called
without an active exception", exit -6, in a CI run and here) and torch 1.13's gloo can hang; first it flushes
and removes the temporary directory torch 1.13's torch.distributed.nn makes, which only interpreter exit removes.
"""
import os
import socket
import sys


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def leave():
    from gradcheck_dist.harness import _drop_torch_tempdir

    _drop_torch_tempdir()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

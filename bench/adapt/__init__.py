"""Online adaptation's benchmarks (`--adapt`, docs/adaptation.md): the stream through two servers, off and
on (`python -m bench.adapt`: run.py, its arguments, stream and report), a call's latency while the trainer
works (latency.py), the trainer's step size offline on the real pair (sweep.py), and what a swap holds a
request up for (swap.py)."""

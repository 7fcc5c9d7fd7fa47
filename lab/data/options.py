"""The data-loading family's option strings."""

from __future__ import annotations

from lab.technique import TRAINING, Option, register_options

register_options(
    Option("workers1", {"data.loader": "dataloader", "data.num_workers": 1}, "data",
           "torch DataLoader with 1 worker process (it shares the cores with compute)", axes=TRAINING),
    Option("workers2", {"data.loader": "dataloader", "data.num_workers": 2}, "data",
           "torch DataLoader with 2 worker processes (they share the cores with compute)", axes=TRAINING),
    Option("prefetch", {"data.loader": "thread"}, "data",
           "a bounded background-thread prefetcher: the next read overlaps this step", axes=TRAINING),
    Option("parallel_reads", {"data.loader": "thread", "data.prefetch_readers": 2}, "data",
           "the thread prefetcher with 2 reads in flight: one read's round trip overlaps another's transfer "
           "(threads asleep on I/O, no core taken)", axes=TRAINING),
)

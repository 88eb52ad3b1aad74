"""Files other tools read: a matplotlib memory plot, a Chrome/Perfetto trace, a torch CUDA memory snapshot.

Why a package of their own: each output is written for one consumer (a person looking at a PNG, ui.perfetto.dev,
``torch.cuda._memory_viz``) and is tested by loading it with that consumer; none of them is imported by the
simulator, and the one that needs a third-party package (matplotlib) imports it only when asked.
"""

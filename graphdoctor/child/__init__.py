"""Code that runs inside a child training process (one per run): the Megatron set-up, the training
loop, observers, taps and the probe worker. The parent never imports this package; it starts
`python -m graphdoctor.child SPEC.json` (diff, count) or `python -m graphdoctor.child.probe.worker`.
"""

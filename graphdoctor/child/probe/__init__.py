"""The probe worker's process (`check --probe`: graphdoctor.probes starts it) and the recording of operations under
capture that it shares with the diff child's culprit hunt, witness and holder watch."""

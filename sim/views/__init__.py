"""Looking at a simulated step: matplotlib figures, Chrome/Perfetto traces, notebook explorers."""

"""Planning: a spec admitted once (read, checked, its provider set up, its model profiled, its calibration
chosen, planned once) for every verb and the daemon; the step model each source gets is chosen here."""

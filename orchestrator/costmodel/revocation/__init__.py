"""Revocation models: lifetime traces and the distributions fitted to them (``model.load_revocation_model``)."""

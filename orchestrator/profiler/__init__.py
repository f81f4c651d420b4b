"""Profile a user's PyTorch model for the cost model (torch is an optional extra: imported lazily).

``torch_profile.profile_factory("pkg.mod:build")`` runs ``build(batch)`` on the meta device (no weights
allocated, no GPU), counts every ATen op of a forward + backward pass by layer and op class, and returns
the cost model's ``ModelProfile`` (per example, per layer, with the op-class split); ``cache`` keeps them
by content (the factory module's source, the batches profiled and the torch version).
"""

"""The controller: observe, reconcile (pure), execute; the daemon and the foreground launcher drive it."""

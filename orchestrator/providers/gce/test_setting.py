"""The one explicit test setting of the gce provider (standard library only: the emulator imports it).

``ORCHESTRATOR_TEST_COMPUTE_EMULATOR=1`` says "this process talks to the Compute API emulator of
orchestrator_testing": anonymous credentials, and VMs reached on this machine (127.0.0.1). Nothing else
turns either on: a custom ``api_endpoint`` keeps the user's credentials and the controller's real address.
"""

from __future__ import annotations

import os

TEST_EMULATOR_ENV = "ORCHESTRATOR_TEST_COMPUTE_EMULATOR"


def emulator_mode() -> bool:
    """True only under the explicit test setting."""
    return os.environ.get(TEST_EMULATOR_ENV) == "1"

"""What every command needs from its surroundings, each once and each in the module named for it:
the device a user names and mixed precision (:mod:`.devices`), seeding and RNG state
(:mod:`.randomness`), stopping at a step boundary on Ctrl-C/SIGTERM (:mod:`.signals`), files written
whole or not at all (:mod:`.files`), one writer per folder (:mod:`.locks`), warnings re-emitted at
the user's call (:mod:`.caller_warnings`) and a model's main output (:mod:`.outputs`)."""

from upzoo.runtime.caller_warnings import warn_at_caller, warnings_at_caller
from upzoo.runtime.devices import autocast, needs_grad_scaler, resolve_device
from upzoo.runtime.files import atomic_write, remove_stale_temporaries, write_error
from upzoo.runtime.locks import FolderLock
from upzoo.runtime.outputs import main_output
from upzoo.runtime.randomness import restore_rng_state, rng_state, seed_everything
from upzoo.runtime.signals import StopFlag, terminate_as_interrupt

__all__ = [
    "resolve_device",
    "autocast",
    "needs_grad_scaler",
    "seed_everything",
    "rng_state",
    "restore_rng_state",
    "StopFlag",
    "terminate_as_interrupt",
    "atomic_write",
    "write_error",
    "FolderLock",
    "remove_stale_temporaries",
    "main_output",
    "warnings_at_caller",
    "warn_at_caller",
]

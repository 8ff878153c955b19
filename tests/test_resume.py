"""Every combination resumes exactly: for each case of tests/cases.py's covering (every registered
algorithm × optimizer, every codec with a compressing algorithm in turn, and the feature
variants), a run stopped at a random step before every switch or phase boundary, and at one after
them, and resumed from its checkpoint gives the straight run's rows, summary and final state, bit
for bit (the simulator, in process; the dist engine and the hooks have their own resume tests).
The check is the conformance kit's (gossamer.testing.resume_difference), which plugin authors run
on their own entries."""

import pytest
from cases import FEATURES, covering

from gossamer.testing import resume_difference

CASES = {**covering(), **FEATURES}


@pytest.mark.parametrize("name", list(CASES))
def test_a_run_stopped_anywhere_and_resumed_is_the_straight_run(name):
    assert resume_difference(CASES[name], name) == (None, 0.0)

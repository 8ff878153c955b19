"""docs/reference.md is what the code generates (python -m gossamer.reference): a key, default or
registered entry added, changed or removed without regenerating it fails here."""

from pathlib import Path

from gossamer.config import Config
from gossamer.reference import comments, generate

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "reference.md"


def test_the_reference_is_current():
    assert REFERENCE.read_text() == generate(), "regenerate: python -m gossamer.reference > docs/reference.md"


def test_every_general_key_is_explained():
    assert set(comments(Config)) == {name for name in Config.__dataclass_fields__ if name != "options"}

"""dmath/settings.py: every DMATH_* variable read and checked in one place, with a clear error."""
import math

import pytest

import dmath
from dmath import settings


def test_unset_variables_give_the_documented_defaults():
    values = settings.read({})
    assert values.device is None and values.timeout_s == 120.0 and values.batch_max == 16
    assert values.batch_age_us == 500.0 and values.batch_share_us == 50.0
    assert values.spin_s == 0.005 and values.spin_bytes_per_s == 2e8
    assert values.replica_cache_bytes == 4 << 30 and values.careful == "auto"
    assert values.profile is False and values.cprofile == ""
    assert values.cuda_graphs and values.graph_collectives and values.cudnn and values.cublaslt and values.tf32
    # an empty value means unset, as a shell's `DMATH_X= python ...` does
    assert settings.read({"DMATH_BATCH_MAX": "", "DMATH_DEVICE": ""}).batch_max == 16


def test_values_are_parsed():
    values = settings.read({"DMATH_DEVICE": "gpu", "DMATH_TIMEOUT_S": "inf", "DMATH_BATCH_MAX": "0",
                            "DMATH_REPLICA_CACHE_BYTES": "1e6", "DMATH_PROFILE": "1", "DMATH_CUDNN": "0",
                            "DMATH_CAREFUL": "always", "DMATH_SPIN_BYTES_PER_S": "inf", "DMATH_READ_AHEAD": "3"})
    assert values.device == "gpu" and math.isinf(values.timeout_s) and values.batch_max == 0
    assert values.replica_cache_bytes == 1_000_000 and values.profile is True and values.cudnn is False
    assert values.careful == "always" and math.isinf(values.spin_bytes_per_s) and values.read_ahead == 3


@pytest.mark.parametrize("name, value, expected", [
    ("DMATH_BATCH_SHARE_US", "inf", "a finite number of microseconds >= 0"),
    ("DMATH_BATCH_AGE_US", "nan", "a finite number of microseconds >= 0"),
    ("DMATH_SPIN_BYTES_PER_S", "0", "a number of bytes per second > 0"),
    ("DMATH_SPIN_S", "-1", "a number of seconds >= 0"),
    ("DMATH_CPROFILE", "/nonexistent/p", "a path prefix in a folder that exists and is writable"),
    ("DMATH_TIMEOUT_S", "soon", "a number of seconds >= 0 (0: no limit)"),
    ("DMATH_BATCH_MAX", "2.5", "a whole number >= 0"),
    ("DMATH_BATCH_MAX", "-1", "a whole number >= 0"),
    ("DMATH_DEVICE", "tpu", "'cpu' or 'gpu' (unset: auto)"),
    ("DMATH_CAREFUL", "sometimes", "'auto', 'always' or 'never'"),
    ("DMATH_PROFILE", "yes", "0 or 1"),
    ("DMATH_REPLICA_CACHE_BYTES", "-5", "a number of bytes >= 0"),
    ("DMATH_READ_AHEAD", "0", "a whole number from 1 to 4"),
    ("DMATH_READ_AHEAD", "5", "a whole number from 1 to 4"),
])
def test_a_bad_value_names_the_variable_its_value_and_what_it_takes(name, value, expected):
    with pytest.raises(settings.SettingError) as info:
        settings.read({name: value})
    assert str(info.value) == f"{name} must be {expected}, got {value!r}"
    assert isinstance(info.value, dmath.DMathError)


def test_a_writable_profile_prefix_is_accepted(tmp_path):
    assert settings.read({"DMATH_CPROFILE": str(tmp_path / "p")}).cprofile == str(tmp_path / "p")


def test_every_variable_has_a_meaning_and_a_unique_name():
    names = [v.name for v in settings.VARIABLES]
    assert len(names) == len(set(names)) and all(v.meaning and v.expected for v in settings.VARIABLES)
    assert all(n.startswith(("DMATH_", "DNN_")) for n in names)

"""What a kernel record keeps of its numbers."""

import math

from pytest_mla.core.records import stable_measures


def test_measured_numbers_keep_four_significant_digits_and_inputs_stay_exact():
    record = {"status": "verified", "seed": 123,
              "case": {"softmax_scale": 0.1352337788608801, "seqlens": [1, 64]},
              "tolerance": {"out": {"rel": 0.015703125}},
              "errors": {"out": {"max_abs_err": 0.0009470644985438703, "cos_diff": 5.270093922371544e-07,
                                 "worst_pos": [1, 0, 47], "tol": {"rel": 0.015703125}, "ok": True},
                         "lse": {"max_abs_err": 1.4789679152471535e-06, "cos_diff": 3.552713678800501e-15}},
              "power": {"profile": {"spread": 1.0123456}, "faults": [{"max_abs": 0.33295449}]}}
    out = stable_measures(record)
    assert out["errors"]["out"]["max_abs_err"] == 0.0009471
    assert out["errors"]["out"]["cos_diff"] == 5.27e-07
    assert out["errors"]["lse"]["max_abs_err"] == 1.479e-06
    assert out["errors"]["lse"]["cos_diff"] == 0.0  # float64 noise, not a measurement
    assert out["errors"]["out"]["worst_pos"] == [1, 0, 47] and out["errors"]["out"]["ok"] is True
    assert out["power"]["faults"] == [{"max_abs": 0.333}]
    # inputs a reader holds the numbers to are kept exactly
    assert out["case"] == record["case"] and out["tolerance"] == record["tolerance"]
    assert out["errors"]["out"]["tol"] == {"rel": 0.015703125} and out["power"]["profile"] == {"spread": 1.0123456}
    assert out["seed"] == 123 and out is not record


def test_non_finite_measures_are_kept_as_they_are():
    out = stable_measures({"max_abs_err": math.inf, "cos_diff": math.nan, "max_rel_err": -math.inf})
    assert out["max_abs_err"] == math.inf and math.isnan(out["cos_diff"]) and out["max_rel_err"] == -math.inf

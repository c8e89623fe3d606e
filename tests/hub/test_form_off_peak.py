"""The spawn form's quote in words (for browsers without JavaScript) with off-peak prices:
the price now and the cheaper start, as the service's quote gives them."""

from __future__ import annotations

from jupyter_gpubudget.core.pricing import describe_start, make_off_peak
from jupyter_gpubudget.hub.form import quote_words

NIGHTS = make_off_peak("UTC", 0.5, ["Mon-Fri 20:00-07:00"])


def test_quote_words_say_the_price_now_and_the_cheaper_start():
    wed_10 = 1796205600.0  # Wednesday 2 December 2026, 10:00 UTC
    answer = {"project": "p", "now": wed_10,
              "quote": {"starts_now": True, "backed": True, "protected_s": 3600,
                        "cost_gpu_hours": 1.0, "price": describe_start(NIGHTS, wed_10)}}
    assert quote_words(answer).endswith(
        "backed. Off-peak prices: now: 1.0× — start after 20:00 UTC for 0.5× (half the cost).")
    answer["quote"]["price"] = describe_start(NIGHTS, wed_10 + 11 * 3600)  # 21:00
    assert quote_words(answer).endswith("Off-peak prices: now: 0.5× (off-peak: half the cost).")
    del answer["quote"]["price"]  # no off-peak prices: the words as before
    assert quote_words(answer).endswith("; backed.")

"""Money in the routing tables: USD amounts as Decimal, and the wider sums the rollups keep."""

from __future__ import annotations

from decimal import Decimal

from ..limits import USD_DECIMAL_PLACES, USD_MAX_DIGITS

USD = {"max_digits": USD_MAX_DIGITS, "decimal_places": USD_DECIMAL_PLACES}
ZERO = Decimal("0")
ROLLUP_USD = {"max_digits": 28, "decimal_places": 10}  # sums of many USD amounts

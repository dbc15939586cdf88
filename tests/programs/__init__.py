"""Helper programs and modules the tests run or import (not tests themselves)."""

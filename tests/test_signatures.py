"""What an argument check remembers: one memo, per callable and shape of call.

``BindingMemo`` is the one home of "these arguments were found to bind":
keyword options against a discovery's ``subscribe``, positional counts
against a predicate or callback, a decorated class's constructor calls.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest

from wool_pooling._core.signatures import BindingMemo
from wool_pooling._core.signatures import check_positional


def _function(a: int, b: int = 0) -> None: ...


class _Unreferable:
    """A callable that cannot be weakly referenced."""

    __slots__ = ()

    def __call__(self, a: int) -> None: ...


def test_a_binding_is_remembered_for_its_callable_and_shape_only() -> None:
    memo: BindingMemo[tuple[int, frozenset[str]]] = BindingMemo()
    memo.add(_function, (1, frozenset()))
    assert memo.binds(_function, (1, frozenset()))
    assert not memo.binds(_function, (2, frozenset()))
    assert not memo.binds(_function, (1, frozenset({"b"})))
    assert not memo.binds(lambda a: None, (1, frozenset()))


def test_a_callable_that_cannot_be_weakly_referenced_is_never_remembered() -> None:
    memo: BindingMemo[int] = BindingMemo()
    unreferable = _Unreferable()
    memo.add(unreferable, 1)
    assert not memo.binds(unreferable, 1)


def test_a_memo_does_not_keep_its_callables_alive() -> None:
    memo: BindingMemo[int] = BindingMemo()

    def made() -> Any:
        def function(a: int) -> None: ...

        return function

    function = made()
    memo.add(function, 1)
    assert memo.binds(function, 1)
    held = weakref.ref(function)
    del function
    gc.collect()
    assert held() is None


def test_a_function_made_anew_shares_its_codes_memo_unless_its_defaults_differ() -> (
    None
):
    """A binding found for one function holds for another made from the same
    code (a lambda per call, a function unpickled), not for one whose defaults
    were changed: its count is checked again, and refused when it must be."""

    def made() -> Any:
        def function(a: int, b: int) -> None: ...

        return function

    first, again, changed = made(), made(), made()
    check_positional(first, 2, lambda: "first")
    check_positional(again, 2, lambda: "again")
    changed.__defaults__ = (0,)
    check_positional(changed, 1, lambda: "changed")
    with pytest.raises(TypeError, match="again must take 1 positional argument"):
        check_positional(again, 1, lambda: "again")

"""Lattice velocity sets: tables, derived quantities, isotropy, validation."""

import itertools

import numpy as np
import pytest

import lbm_jax
from lbm_jax import Lattice, get_lattice, list_lattices

SIZES = {"D2Q9": (9, 2), "D3Q19": (19, 3), "D3Q27": (27, 3)}


@pytest.mark.parametrize("name", list(SIZES))
def test_lattice_sizes_and_rest_first(name):
    lat = get_lattice(name)
    assert (lat.q, lat.d) == SIZES[name]
    assert lat.c.shape == (lat.q, lat.d) and lat.w.shape == (lat.q,)
    np.testing.assert_array_equal(lat.c[0], np.zeros(lat.d))
    assert lat.w.dtype == np.float64
    assert lat.cs2 == pytest.approx(1 / 3)


@pytest.mark.parametrize("name", list(SIZES))
def test_lattice_opposite_is_an_involution_reversing_velocities(name):
    lat = get_lattice(name)
    opp = lat.opposite
    np.testing.assert_array_equal(opp[opp], np.arange(lat.q))
    np.testing.assert_array_equal(lat.c[opp], -lat.c)
    np.testing.assert_array_equal(lat.w[opp], lat.w)
    assert opp[0] == 0


@pytest.mark.parametrize("name", list(SIZES))
def test_lattice_fourth_order_isotropy(name):
    # sum_i w_i c_a c_b c_c c_d = cs^4 (d_ab d_cd + d_ac d_bd + d_ad d_bc): the
    # property the second-order equilibrium relies on (not checked at build time).
    lat = get_lattice(name)
    d = lat.d
    got = np.einsum("q,qa,qb,qc,qd->abcd", lat.w, lat.c, lat.c, lat.c, lat.c)
    eye = np.eye(d)
    want = (1 / 9) * (
        np.einsum("ab,cd->abcd", eye, eye)
        + np.einsum("ac,bd->abcd", eye, eye)
        + np.einsum("ad,bc->abcd", eye, eye)
    )
    np.testing.assert_allclose(got, want, atol=1e-15)


def test_lattice_weights_by_speed():
    lat = get_lattice("D3Q27")
    norms = (lat.c**2).sum(axis=1)
    expected = {0: 8 / 27, 1: 2 / 27, 2: 1 / 54, 3: 1 / 216}
    counts = {0: 1, 1: 6, 2: 12, 3: 8}
    for n, weight in expected.items():
        np.testing.assert_allclose(lat.w[norms == n], weight)
        assert int((norms == n).sum()) == counts[n]
    d3q19 = get_lattice("D3Q19")
    assert int(((d3q19.c**2).sum(axis=1) == 3).sum()) == 0


def test_get_lattice_names_and_identity():
    assert list_lattices() == ("D2Q9", "D3Q19", "D3Q27")
    lat = get_lattice("d3q19")
    assert lat.name == "D3Q19"
    assert get_lattice(lat) is lat
    assert lat == get_lattice("D3Q19") and hash(lat) == hash(get_lattice("D3Q19"))
    assert lat != get_lattice("D3Q27")
    assert lbm_jax.get_lattice is get_lattice


def test_get_lattice_rejects_unknown_names():
    with pytest.raises(ValueError, match="D3Q15.*D2Q9"):
        get_lattice("D3Q15")
    with pytest.raises(TypeError, match="str or Lattice"):
        get_lattice(19)


def test_lattice_index_round_trip():
    lat = get_lattice("D2Q9")
    for i, ci in enumerate(lat.c):
        assert lat.index(tuple(ci)) == i
    with pytest.raises(ValueError, match=r"\(2, 0\) is not in lattice D2Q9"):
        lat.index((2, 0))


def test_lattice_validates_tables():
    c = np.array(list(itertools.product((0, 1, -1), repeat=2)))
    w_ok = get_lattice("D2Q9").w[[get_lattice("D2Q9").index(tuple(v)) for v in c]]
    custom = Lattice("mine", c, w_ok)
    assert custom.q == 9 and np.array_equal(custom.c[custom.opposite], -custom.c)
    with pytest.raises(ValueError, match="isotropy"):
        Lattice("bad", c, np.full(9, 1 / 9))
    with pytest.raises(ValueError, match="shape"):
        Lattice("bad", c, w_ok[:5])
    with pytest.raises(ValueError, match="distinct"):
        Lattice("bad", np.vstack([c, c[:1]]), np.append(w_ok, 0.0))
    assert not custom.c.flags.writeable

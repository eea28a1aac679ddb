"""The runtime's adding epilogues (`cutegen.runtime.manifest.ADDING_EPILOGUES`) are the generator's (`Epilogue.adds_into_d`)."""

from cutegen.runtime.manifest import ADDING_EPILOGUES, adds_into_d
from cutegen.schedules.spec import Epilogue


def test_runtime_and_generator_agree_on_the_adding_epilogues():
    assert ADDING_EPILOGUES == {e.value for e in Epilogue if e.adds_into_d}
    for e in Epilogue:
        assert adds_into_d({"epilogue": e.value}) == e.adds_into_d
    assert not adds_into_d({})


def test_split_k_adding_epilogue_splits_and_adds():
    e = Epilogue.SPLIT_K_TMA_STORE_ADD
    assert e.splits_k and e.adds_into_d and not e.splits_last_wave_only and e.tag == "episkadd"

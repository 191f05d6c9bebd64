"""Settings from the environment are read in one place (``runtime.settings``): sizes as a person writes them
(``2GB``, ``500MB``), and a value that does not parse is a SettingError naming the variable and what it takes,
raised where the setting is used, never a bare KeyError or int() error from deep inside a call."""
import pytest
import torch

from torch_stablehlo.exporter import export_to_stablehlo
from torch_stablehlo.runtime import compile_cache, settings
from torch_stablehlo.runtime.compile_cache import CompileCache
from torch_stablehlo.runtime.settings import SettingError, parse_size

from .bundles import small_artifact


@pytest.mark.parametrize("text, size", [("2GB", 2 * 10 ** 9), ("500MB", 500 * 10 ** 6), ("500 mb", 500 * 10 ** 6),
                                        ("1.5GiB", 3 * 2 ** 29), ("64KiB", 65536), ("4096", 4096), ("10B", 10)])
def test_sizes_are_read_as_a_person_writes_them(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("setting, text", [
    (settings.MAX_EXECUTABLES, "0"), (settings.MAX_EXECUTABLES, "-3"), (settings.MAX_EXECUTABLES, "lots"),
    (settings.CACHE_MAX_BYTES, "2 parsecs"), (settings.CACHE_MAX_BYTES, "0MB"), (settings.CACHE_MAX_BYTES, "1e9"),
    (settings.CACHE_SHARED, "maybe"), (settings.DEBUG, "2"), (settings.CHECK_SECONDS, "0"),
    (settings.MAX_MANIFEST_BYTES, "9" * 5000)])
def test_a_value_that_does_not_parse_names_its_variable_and_what_it_takes(monkeypatch, setting, text):
    monkeypatch.setenv(setting.variable, text)
    with pytest.raises(SettingError, match=rf"\${setting.variable}=.* is not a valid setting: it takes "):
        setting.value()


def test_an_unset_or_empty_variable_is_the_default(monkeypatch):
    for setting in settings.SETTINGS:
        monkeypatch.setenv(setting.variable, "")
        assert setting.value() == setting.default
        monkeypatch.delenv(setting.variable)
        assert setting.value() == setting.default


def test_max_executables_of_zero_is_refused_at_the_call_not_a_key_error(monkeypatch):
    model, artifact = small_artifact()
    monkeypatch.setenv(settings.MAX_EXECUTABLES.variable, "0")
    with pytest.raises(SettingError, match="TORCH_STABLEHLO_MAX_EXECUTABLES='0'.*a whole number of at least 1"):
        artifact(torch.randn(3, 8))
    monkeypatch.setenv(settings.MAX_EXECUTABLES.variable, "1")
    for batch in (3, 4, 3):
        x = torch.randn(batch, 8)
        torch.testing.assert_close(artifact(x), model(x), rtol=1e-5, atol=1e-5)  # f32 matmul of 8 terms
    assert len(artifact._executables) == 1


def test_a_cache_bound_in_gigabytes_compiles_and_is_used(monkeypatch, tmp_path):
    compile_cache._usable.cache_clear()
    monkeypatch.setenv(compile_cache.DIR_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setenv(settings.CACHE_MAX_BYTES.variable, "2GB")
    assert CompileCache.from_environment().max_bytes == 2 * 10 ** 9
    model, x = torch.nn.Linear(8, 5).eval(), torch.randn(3, 8)
    torch.testing.assert_close(export_to_stablehlo(model, (x,))(x), model(x), rtol=1e-5, atol=1e-5)  # f32, 8 terms
    assert any((tmp_path / "cache").iterdir()), "the compiled module was written to the cache"
    compile_cache._usable.cache_clear()

"""`python -m rosefast generate`: a completion from our engine, and clear errors."""
from rosefast.__main__ import main


def test_generate_prints_a_completion(default_model, capsys):
    assert main(["generate", "What is the capital of France?", "--max-tokens", "12", "--dtype", "float32"]) == 0
    assert "Paris" in capsys.readouterr().out
    assert main(["generate", "What is 2+2?", "--max-tokens", "16"]) == 0   # the default dtype
    assert "4" in capsys.readouterr().out


def test_generate_reports_bad_input(default_model, capsys):
    assert main(["generate", "hi", "--max-tokens", "0"]) == 2
    assert "max_tokens must be >= 1" in capsys.readouterr().err
    assert main(["generate", "hi", "--model", "/no/such/model"]) == 2
    assert "does not exist" in capsys.readouterr().err

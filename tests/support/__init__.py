"""What the tests share: helpers, fake inputs and real servers. Test modules import from here, never from each other
(tests/unit/test_layout.py holds them to it)."""

"""A fleet of Sluice instances run as one: the run-time changeable sections kept in a Kafka topic.

- :mod:`.records`: the control records and the rules every instance folds them with (sans-IO);
- :mod:`.status`: the status records and the table of ``sluice fleet status`` (sans-IO);
- :mod:`.kafka_config`: the librdkafka properties of the fleet's clients ([fleet] over [upstream]);
- :mod:`.control`: the I/O: the control topic followed and written, the status published;
- :mod:`.cli`: ``sluice fleet status``.

Not a policy: it works on "the dynamic sections" whatever policies declare them (``Settings.dynamic_sections``).
"""

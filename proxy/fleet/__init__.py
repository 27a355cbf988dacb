"""A fleet of Sluice instances run as one: the run-time changeable sections kept in a Kafka topic.

- :mod:`.records`: the control records, their revisions (offsets) and the rules every instance folds them with
  (sans-IO);
- :mod:`.history`: every change made, who made it (sans-IO);
- :mod:`.status`: the status records and the table of ``sluice fleet status`` (sans-IO);
- :mod:`.kafka_config`: the librdkafka properties of the fleet's clients ([fleet] over [upstream]);
- :mod:`.topics`: the fleet's topics created with the settings the design relies on, checked, read to their end;
- :mod:`.writer`: a change written (a fenced transaction: control and history records);
- :mod:`.control`: an instance's I/O: the control topic followed, changes written, the status published;
- :mod:`.routes`: the admin API's rollback;
- :mod:`.cli`: ``sluice fleet status | history | rollback``.

Not a policy: it works on "the dynamic sections" whatever policies declare them (``Settings.dynamic_sections``).
"""

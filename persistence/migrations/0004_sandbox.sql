-- A lease is 'creating' while a claim builds its sandbox with no transaction open.
ALTER TABLE sandbox_leases DROP CONSTRAINT sandbox_leases_state_check;
ALTER TABLE sandbox_leases ADD CONSTRAINT sandbox_leases_state_check
    CHECK (state IN ('active', 'creating', 'releasing', 'released'));

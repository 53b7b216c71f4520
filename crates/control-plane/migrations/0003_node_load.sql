-- Utilisation averaged over about a minute, reported by agents; placement uses
-- it so that a burst of launches does not make a node refuse work.
ALTER TABLE nodes ADD COLUMN load_cpu_percent DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE nodes ADD COLUMN load_memory_percent DOUBLE PRECISION NOT NULL DEFAULT 0;

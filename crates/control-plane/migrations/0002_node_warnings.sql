-- Why a node runs with less isolation than configured (JSON array of strings).
ALTER TABLE nodes ADD COLUMN warnings TEXT NOT NULL DEFAULT '[]';

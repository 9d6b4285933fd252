-- One PostgreSQL server, one database per service (DESIGN.md).
CREATE DATABASE payments;
CREATE DATABASE rewards;
CREATE DATABASE notifications;

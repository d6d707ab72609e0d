-- The demo web tier's social schema (loadtest/webtier.py). Invalidation rules for these tables are in
-- examples/local.toml: users -> user:{id}, user:email:{email}; posts -> post:{id}, feed:{author_id};
-- follows -> followers:{followee_id}, following:{follower_id}.
-- webtier.install_schema() runs this with `app` replaced by the database name it is given.
CREATE DATABASE IF NOT EXISTS app;
USE app;

CREATE TABLE IF NOT EXISTS users (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  name VARCHAR(100) NOT NULL,
  email VARCHAR(191) NOT NULL,
  UNIQUE KEY email (email)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS posts (
  id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY,
  author_id BIGINT NOT NULL,
  body TEXT NOT NULL,
  KEY author_recent (author_id, id)
) ENGINE=InnoDB;

CREATE TABLE IF NOT EXISTS follows (
  follower_id BIGINT NOT NULL,
  followee_id BIGINT NOT NULL,
  PRIMARY KEY (follower_id, followee_id),
  KEY followee (followee_id, follower_id)
) ENGINE=InnoDB;
